//! The one consumer of `shardlease-e2e` on a DynamoDB table's change stream: moto's server
//! (`SHARDLEASE_TEST_DYNAMODB_ENDPOINT`, started by `scripts/services.sh`) serves the table and its
//! stream, a SQLite file holds the leases, and every change written (half before the consumer
//! starts, half while it runs) is processed exactly once. The consumer code is unchanged: only
//! the [`ShardSource`] it is handed is a `DynamoDbStreamsSource`.
//!
//! A test whose variable is unset prints that it is skipped, and fails under `CI=true`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType, StreamSpecification, StreamViewType,
};
use aws_sdk_dynamodb::Client;
use shardlease::dynamodb_streams::EventName;
use shardlease::{
    ChangeEvent, DynamoDbStreamsSource, LeaseKey, Position, Record, ShardReader, ShardSource,
};
use shardlease_e2e::run_consumer;
use shardlease_examples::{poll_until, DeliveryLog};
use shardlease_testkit::fresh_namespace;
use shardlease_testkit::suite::env_or_skip;

/// How long any one wait may take.
const DEADLINE: Duration = Duration::from_secs(90);
/// How often conditions are checked.
const POLL: Duration = Duration::from_millis(50);
/// Changes written: half before the consumer starts, half while it runs.
const CHANGES: usize = 40;
/// Items the changes go round.
const ITEMS: usize = 5;

fn client(endpoint: &str) -> Client {
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("dummy", "dummy", None, None, "test"))
        .build();
    Client::from_conf(conf)
}

/// A table keyed by the string `pk` with a `NEW_AND_OLD_IMAGES` stream.
async fn create_table(client: &Client, name: &str) {
    client
        .create_table()
        .table_name(name)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewAndOldImages)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("create table {name}: {e:?}"));
}

/// Change `i`: item `i % ITEMS` goes round put (INSERT), update (MODIFY), delete (REMOVE).
async fn write_change(client: &Client, table: &str, i: usize) -> EventName {
    let key = HashMap::from([("pk".to_owned(), AttributeValue::S(format!("item-{}", i % ITEMS)))]);
    match (i / ITEMS) % 3 {
        0 => {
            let mut item = key;
            item.insert("n".to_owned(), AttributeValue::N(i.to_string()));
            client.put_item().table_name(table).set_item(Some(item)).send().await.unwrap();
            EventName::Insert
        }
        1 => {
            client
                .update_item()
                .table_name(table)
                .set_key(Some(key))
                .update_expression("SET n = :n")
                .expression_attribute_values(":n", AttributeValue::N(i.to_string()))
                .send()
                .await
                .unwrap();
            EventName::Modify
        }
        _ => {
            client.delete_item().table_name(table).set_key(Some(key)).send().await.unwrap();
            EventName::Remove
        }
    }
}

/// Reads `want` records from the start of `shard`.
async fn read_all(source: &dyn ShardSource, shard: &LeaseKey, want: usize) -> Vec<Record> {
    let mut reader: Box<dyn ShardReader> =
        source.open(shard, &Position::TrimHorizon).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(DEADLINE, async {
        while out.len() < want {
            let batch = reader.next_batch().await.unwrap();
            out.extend(batch.records.iter().cloned());
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out reading {want} changes"));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_processes_every_change_of_a_table_once() {
    let Some(endpoint) = env_or_skip("SHARDLEASE_TEST_DYNAMODB_ENDPOINT") else { return };
    let started = Instant::now();
    let db = client(&endpoint);
    let table = fresh_namespace("e2e-streams");
    create_table(&db, &table).await;
    let source = || async {
        DynamoDbStreamsSource::builder(table.as_str())
            .region("us-east-1")
            .endpoint_url(&endpoint)
            .static_credentials("dummy", "dummy")
            .idle_interval(Duration::from_millis(50))
            .build()
            .await
            .unwrap()
    };

    let mut kinds = Vec::new();
    for i in 0..CHANGES / 2 {
        kinds.push(write_change(&db, &table, i).await);
    }
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?namespace={}",
        dir.path().join("leases.db").display(),
        fresh_namespace("e2e-streams")
    );
    let log = DeliveryLog::new();
    let consumer = run_consumer(
        &url,
        "streams-consumer",
        Arc::new(source().await),
        &log,
        Duration::from_millis(200),
    )
    .await
    .unwrap_or_else(|e| panic!("starting the consumer: {e}"));
    for i in CHANGES / 2..CHANGES {
        kinds.push(write_change(&db, &table, i).await);
    }

    // What was written, as the stream has it.
    let reading = source().await;
    let shards = reading.list_shards().await.unwrap();
    assert_eq!(shards.len(), 1, "moto keeps one shard per table: {shards:?}");
    let shard = shards[0].id.clone();
    let records = read_all(&reading, &shard, CHANGES).await;
    assert_eq!(records.len(), CHANGES);
    let got: Vec<EventName> =
        records.iter().map(|r| ChangeEvent::from_record(r).unwrap().event_name).collect();
    assert_eq!(got, kinds, "the changes, typed, in the order written");

    let ids: Vec<_> = records.iter().map(|r| (shard.clone(), r.seq.clone(), r.sub)).collect();
    poll_until("every change processed", DEADLINE, POLL, || async {
        ids.iter().all(|id| log.deliveries(id) > 0).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let report = consumer.shutdown().await;
    assert!(report.abandoned.is_empty(), "{report:?}");

    for id in &ids {
        assert_eq!(log.deliveries(id), 1, "{id:?} processed once");
    }
    assert_eq!(log.distinct(), CHANGES as u64, "nothing but the changes written");
    assert_eq!(log.redelivered(), 0);
    // The lease, in the SQLite file, is checkpointed at the last change and released.
    let store = shardlease::connect(&url).await.unwrap();
    let lease = store.get_lease(&shard).await.unwrap().expect("the shard's lease").lease;
    assert_eq!(
        lease.checkpoint,
        Position::Sequence { seq: records[CHANGES - 1].seq.clone(), sub: 0 }
    );
    assert_eq!(lease.owner, None, "released by the shutdown");
    let _ = db.delete_table().table_name(&table).send().await;
    println!(
        "dynamodb-streams e2e: {CHANGES} changes, each processed once, in {:?}",
        started.elapsed()
    );
}
