//! Helpers shared by the tests against a Kinesis emulator (kinesalite): the endpoint from
//! `SHARDLEASE_TEST_KINESIS_ENDPOINT` (a skip locally when unset, a failure under `CI=true`), an
//! admin client, streams with random names, puts, splits and merges that wait until the stream is
//! active again, and reading helpers that wait for a condition with a deadline (never a fixed
//! sleep standing in for one). [`ferro`] starts the in-process emulator of the fan-out tests.

// Each test file uses a different subset of these helpers.
#![allow(dead_code)]

use std::time::Duration;

use aws_sdk_kinesis::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::StreamStatus;
use aws_sdk_kinesis::Client;
use bytes::Bytes;
use rand::Rng;
use shardlease_core::{Record, ShardInfo, ShardReader};
use shardlease_kinesis::{KinesisSource, ReadConfig};
use shardlease_testkit::suite::env_or_skip;

pub mod ferro;
pub mod fleet;

/// The variable naming the emulator.
pub const ENDPOINT_VAR: &str = "SHARDLEASE_TEST_KINESIS_ENDPOINT";

/// How long any awaited condition may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The emulator and an admin client on it.
pub struct Emulator {
    pub endpoint: String,
    pub client: Client,
}

/// The emulator, or `None` (the test is then skipped; under `CI=true` this panics instead).
pub fn emulator() -> Option<Emulator> {
    let endpoint = env_or_skip(ENDPOINT_VAR)?;
    let conf = aws_sdk_kinesis::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(&endpoint)
        .credentials_provider(Credentials::new("dummy", "dummy", None, None, "test"))
        .timeout_config(
            aws_sdk_kinesis::config::timeout::TimeoutConfig::builder()
                .operation_timeout(Duration::from_secs(10))
                .build(),
        )
        .build();
    Some(Emulator { endpoint, client: Client::from_conf(conf) })
}

/// Reading settings for tests: the emulator has no rate limits, so calls may come faster.
pub fn fast_reads() -> ReadConfig {
    let mut c = ReadConfig::default();
    c.min_call_interval = Duration::from_millis(10);
    c.idle_interval = Duration::from_millis(50);
    c.base_backoff = Duration::from_millis(20);
    c.max_backoff = Duration::from_millis(500);
    c.operation_timeout = Duration::from_secs(5);
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

impl Emulator {
    /// A source on `stream` with the test read settings.
    pub async fn source(&self, stream: &str, read: ReadConfig) -> KinesisSource {
        KinesisSource::builder(stream)
            .region("us-east-1")
            .endpoint_url(&self.endpoint)
            .static_credentials("dummy", "dummy")
            .read_config(read)
            .build()
            .await
            .unwrap_or_else(|e| panic!("building the source: {e}"))
    }

    /// A new stream of `shards` shards with a random name, once it is active.
    pub async fn create_stream(&self, shards: i32) -> String {
        let name = format!("t-{:016x}", rand::rng().random::<u64>());
        self.client
            .create_stream()
            .stream_name(&name)
            .shard_count(shards)
            .send()
            .await
            .unwrap_or_else(|e| panic!("create stream: {e:?}"));
        self.wait_active(&name).await;
        name
    }

    /// Waits until the stream is `ACTIVE`.
    pub async fn wait_active(&self, stream: &str) {
        eventually("the stream to be active", || async {
            let out =
                self.client.describe_stream_summary().stream_name(stream).send().await.ok()?;
            let s = out.stream_description_summary?;
            (s.stream_status == StreamStatus::Active).then_some(())
        })
        .await;
    }

    /// Puts one record; returns its shard and sequence number.
    pub async fn put(&self, stream: &str, key: &str, data: impl Into<Bytes>) -> (String, String) {
        self.put_with(stream, key, None, data.into()).await
    }

    /// Puts one record with an explicit hash key (routing it to a chosen shard).
    pub async fn put_with(
        &self,
        stream: &str,
        key: &str,
        explicit_hash_key: Option<u128>,
        data: Bytes,
    ) -> (String, String) {
        let out = self
            .client
            .put_record()
            .stream_name(stream)
            .partition_key(key)
            .set_explicit_hash_key(explicit_hash_key.map(|h| h.to_string()))
            .data(Blob::new(data.to_vec()))
            .send()
            .await
            .unwrap_or_else(|e| panic!("put: {e:?}"));
        (out.shard_id, out.sequence_number)
    }

    /// Splits `shard` at `new_start` and waits until the stream is active again.
    pub async fn split(&self, stream: &str, shard: &str, new_start: u128) {
        self.client
            .split_shard()
            .stream_name(stream)
            .shard_to_split(shard)
            .new_starting_hash_key(new_start.to_string())
            .send()
            .await
            .unwrap_or_else(|e| panic!("split: {e:?}"));
        self.wait_active(stream).await;
    }

    /// Merges two adjacent shards and waits until the stream is active again.
    pub async fn merge(&self, stream: &str, shard: &str, adjacent: &str) {
        self.client
            .merge_shards()
            .stream_name(stream)
            .shard_to_merge(shard)
            .adjacent_shard_to_merge(adjacent)
            .send()
            .await
            .unwrap_or_else(|e| panic!("merge: {e:?}"));
        self.wait_active(stream).await;
    }

    /// Deletes the stream (best effort).
    pub async fn delete(&self, stream: &str) {
        let _ = self.client.delete_stream().stream_name(stream).send().await;
    }
}

/// Reads until `want` records arrived or the shard ended; returns the records and the end.
pub async fn read_records(
    reader: &mut Box<dyn ShardReader>,
    want: usize,
) -> (Vec<Record>, Option<Vec<ShardInfo>>) {
    let mut out = Vec::new();
    let read = async {
        loop {
            let batch = reader.next_batch().await.unwrap_or_else(|e| panic!("next_batch: {e}"));
            out.extend(batch.records.iter().cloned());
            if batch.end.is_some() || out.len() >= want {
                return batch.end;
            }
        }
    };
    let end = tokio::time::timeout(DEADLINE, read)
        .await
        .unwrap_or_else(|_| panic!("timed out reading {want} records"));
    (out, end)
}

/// Reads to the shard's end; returns the records and the children.
pub async fn read_to_end(reader: &mut Box<dyn ShardReader>) -> (Vec<Record>, Vec<ShardInfo>) {
    let (records, end) = read_records(reader, usize::MAX).await;
    (records, end.unwrap_or_default())
}

/// The payloads as strings.
pub fn payloads(records: &[Record]) -> Vec<String> {
    records.iter().map(|r| String::from_utf8_lossy(&r.data).into_owned()).collect()
}
