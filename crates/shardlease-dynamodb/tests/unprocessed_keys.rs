//! `get_workers` asks again for the keys a `BatchGetItem` hands back unprocessed until every key
//! was read, and gives up with a retryable error only when rounds in a row read nothing. moto
//! never leaves keys unprocessed, so a tiny HTTP server on loopback plays DynamoDB: it answers
//! `DescribeTable` with an active table and each `BatchGetItem` with a worker item for the first
//! `per_call` keys it was asked for, the others unprocessed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use shardlease_core::store::LeaseStore;
use shardlease_core::{Error, WorkerId};
use shardlease_dynamodb::DynamoDbStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod fake_http;
use fake_http::read_head;

const TABLE: &str = "unprocessed";

struct Fake {
    endpoint: String,
    calls: Arc<AtomicUsize>,
}

/// A fake DynamoDB answering each `BatchGetItem` with at most `per_call` items.
async fn fake(per_call: usize) -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(serve(conn, per_call, counter.clone()));
        }
    });
    Fake { endpoint, calls }
}

async fn serve(mut conn: TcpStream, per_call: usize, calls: Arc<AtomicUsize>) {
    let mut buf = Vec::new();
    loop {
        let Some((head_len, body_len, target)) = read_head(&mut conn, &mut buf).await else {
            return;
        };
        while buf.len() < head_len + body_len {
            let mut chunk = [0u8; 4096];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Value =
            serde_json::from_slice(&buf[head_len..head_len + body_len]).unwrap_or(Value::Null);
        buf.drain(..head_len + body_len);
        let reply = if target.ends_with("describetable") {
            describe_table()
        } else if target.ends_with("batchgetitem") {
            calls.fetch_add(1, Ordering::SeqCst);
            batch_get(&body, per_call)
        } else {
            json!({})
        }
        .to_string();
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.0\r\n\
             x-amzn-requestid: fake\r\ncontent-length: {}\r\n\r\n{reply}",
            reply.len()
        );
        if conn.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn batch_get(body: &Value, per_call: usize) -> Value {
    let request = &body["RequestItems"][TABLE];
    assert_eq!(request["ConsistentRead"], json!(true), "consistent reads: {request}");
    let keys = request["Keys"].as_array().cloned().unwrap_or_default();
    assert!(keys.len() <= 100, "at most 100 keys per call, got {}", keys.len());
    let (answered, left) = keys.split_at(per_call.min(keys.len()));
    let items: Vec<Value> = answered
        .iter()
        .map(|k| {
            json!({
                "pk": k["pk"], "sk": k["sk"], "beat": {"N": "7"},
                "updated_at_millis": {"N": "1"}, "lease_count": {"N": "0"}
            })
        })
        .collect();
    let mut reply = json!({ "Responses": { TABLE: items } });
    if !left.is_empty() {
        reply["UnprocessedKeys"] = json!({ TABLE: { "Keys": left, "ConsistentRead": true } });
    }
    reply
}

fn describe_table() -> Value {
    json!({"Table": {
        "TableName": TABLE, "TableStatus": "ACTIVE",
        "KeySchema": [
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"}
        ],
        "AttributeDefinitions": [
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"}
        ]
    }})
}

async fn store(endpoint: &str) -> DynamoDbStore {
    DynamoDbStore::builder()
        .table(TABLE)
        .region("us-east-1")
        .endpoint_url(endpoint)
        .credentials("key", "secret", None)
        .namespace("ns")
        .max_attempts(3)
        .initial_backoff(Duration::from_millis(1))
        .connect()
        .await
        .unwrap()
}

fn ids(n: usize) -> Vec<WorkerId> {
    (0..n).map(|i| WorkerId::from(format!("w{i:03}"))).collect()
}

#[tokio::test]
async fn unprocessed_keys_are_asked_for_again_until_every_one_is_read() {
    let server = fake(30).await;
    let s = store(&server.endpoint).await;
    let got = s.get_workers(&ids(130)).await.unwrap();
    assert_eq!(got.items.len(), 130, "every key read once");
    assert!(got.corrupt.is_empty());
    let mut read: Vec<_> = got.items.iter().map(|w| w.id.clone()).collect();
    read.sort();
    read.dedup();
    assert_eq!(read, ids(130));
    // 100 keys: 4 calls of 30 (the last 10); 30 keys: 1 call.
    assert_eq!(server.calls.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn rounds_that_read_nothing_end_in_a_retryable_error() {
    let server = fake(0).await;
    let s = store(&server.endpoint).await;
    match s.get_workers(&ids(3)).await {
        Err(e @ Error::Backend { retryable: true, .. }) => {
            assert!(e.to_string().contains("unprocessed"), "{e}")
        }
        other => panic!("expected a retryable backend error, got {other:?}"),
    }
    assert_eq!(server.calls.load(Ordering::SeqCst), 3, "max_attempts rounds, then give up");
}
