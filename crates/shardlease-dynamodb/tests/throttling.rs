//! Throttling is retried with backoff inside the store and, when the retries run out, reported
//! as a retryable `Error::Backend` (never a conflict, a lost lease or a corrupt record), so the
//! runtime tries again on its next beat. moto never throttles, so a tiny HTTP server on loopback
//! plays DynamoDB: it answers `DescribeTable` with an active table and throttles every other call
//! a set number of times before answering it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shardlease_core::store::{LeaseStore, WorkerRecord};
use shardlease_core::Error;
use shardlease_dynamodb::DynamoDbStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod fake_http;
use fake_http::read_head;

const TABLE: &str = "throttled";

/// A fake DynamoDB: throttles the first `throttles` data calls with `code`, then answers `{}`.
struct Fake {
    endpoint: String,
    data_calls: Arc<AtomicUsize>,
}

async fn fake(code: &'static str, throttles: usize) -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let data_calls = Arc::new(AtomicUsize::new(0));
    let calls = data_calls.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let calls = calls.clone();
            tokio::spawn(serve(conn, code, throttles, calls));
        }
    });
    Fake { endpoint, data_calls }
}

/// Answers the requests of one connection (keep-alive) until the client closes it.
async fn serve(mut conn: TcpStream, code: &str, throttles: usize, calls: Arc<AtomicUsize>) {
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
        buf.drain(..head_len + body_len);
        let (status, body) = if target.ends_with("describetable") {
            ("200 OK", describe_table())
        } else if calls.fetch_add(1, Ordering::SeqCst) < throttles {
            let body = format!(
                r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{code}","message":"slow down"}}"#
            );
            ("400 Bad Request", body)
        } else {
            ("200 OK", "{}".to_owned())
        };
        let reply = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/x-amz-json-1.0\r\n\
             x-amzn-requestid: fake\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if conn.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn describe_table() -> String {
    format!(
        r#"{{"Table":{{"TableName":"{TABLE}","TableStatus":"ACTIVE","KeySchema":[{{"AttributeName":"pk","KeyType":"HASH"}},{{"AttributeName":"sk","KeyType":"RANGE"}}],"AttributeDefinitions":[{{"AttributeName":"pk","AttributeType":"S"}},{{"AttributeName":"sk","AttributeType":"S"}}]}}}}"#
    )
}

async fn store(endpoint: &str, attempts: u32) -> DynamoDbStore {
    DynamoDbStore::builder()
        .table(TABLE)
        .region("us-east-1")
        .endpoint_url(endpoint)
        .credentials("key", "secret", None)
        .namespace("ns")
        .max_attempts(attempts)
        .initial_backoff(Duration::from_millis(1))
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn throttled_calls_are_retried_until_they_pass() {
    for code in ["ThrottlingException", "ProvisionedThroughputExceededException"] {
        let server = fake(code, 3).await;
        let s = store(&server.endpoint, 4).await;
        assert_eq!(s.get_lease(&"k".into()).await.unwrap(), None, "{code}");
        assert_eq!(server.data_calls.load(Ordering::SeqCst), 4, "three throttled, one answered");
        // A heartbeat (the worker's renewal) likewise goes through after throttling.
        let server = fake(code, 2).await;
        let s = store(&server.endpoint, 4).await;
        s.heartbeat(&WorkerRecord::new("w".into(), 1)).await.unwrap();
        assert_eq!(server.data_calls.load(Ordering::SeqCst), 3);
    }
}

#[tokio::test]
async fn throttling_beyond_the_retries_is_a_retryable_backend_error() {
    let fake = fake("ProvisionedThroughputExceededException", usize::MAX).await;
    let store = store(&fake.endpoint, 3).await;
    let e = store.heartbeat(&WorkerRecord::new("w".into(), 1)).await.expect_err("throttled");
    match &e {
        Error::Backend { retryable: true, message, .. } => {
            assert!(message.contains("ProvisionedThroughputExceeded"), "{message}")
        }
        other => panic!("expected a retryable backend error, got {other:?}"),
    }
    assert_eq!(fake.data_calls.load(Ordering::SeqCst), 3, "max_attempts calls, then give up");
    let e = store.list_leases().await.expect_err("throttled");
    assert!(e.is_retryable() && matches!(e, Error::Backend { .. }), "{e}");
}
