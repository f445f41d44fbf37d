//! The harness's own Kinesis client on the shared emulator: it creates the run's stream, splits
//! and merges its shards (the stream changes under the fleet's feet), and is the producer's way
//! to write records.

use std::time::Duration;

use shardlease::kinesis::aws_sdk_kinesis::config::{BehaviorVersion, Credentials, Region};
use shardlease::kinesis::aws_sdk_kinesis::primitives::Blob;
use shardlease::kinesis::aws_sdk_kinesis::types::StreamStatus;
use shardlease::kinesis::aws_sdk_kinesis::{self, Client};
use shardlease::BoxError;

/// A client on `endpoint` with dummy credentials and an operation timeout (an emulator may never
/// answer some calls).
pub fn client(endpoint: &str) -> Client {
    let conf = aws_sdk_kinesis::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("dummy", "dummy", None, None, "chaos"))
        .timeout_config(
            aws_sdk_kinesis::config::timeout::TimeoutConfig::builder()
                .operation_timeout(Duration::from_secs(10))
                .build(),
        )
        .build();
    Client::from_conf(conf)
}

/// An open shard and its hash range.
#[derive(Clone, Debug)]
pub struct OpenShard {
    /// The shard id.
    pub id: String,
    /// First hash key.
    pub start: u128,
    /// Last hash key.
    pub end: u128,
}

/// Creates `stream` with `shards` shards and waits until it is active.
pub async fn create_stream(c: &Client, stream: &str, shards: i32) -> Result<(), BoxError> {
    c.create_stream().stream_name(stream).shard_count(shards).send().await?;
    wait_active(c, stream).await
}

/// Waits (up to a minute) until `stream` is active.
pub async fn wait_active(c: &Client, stream: &str) -> Result<(), BoxError> {
    for _ in 0..600 {
        if let Ok(out) = c.describe_stream_summary().stream_name(stream).send().await {
            if out.stream_description_summary.map(|s| s.stream_status) == Some(StreamStatus::Active)
            {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("stream {stream} not active within a minute").into())
}

/// The open shards of `stream`, by starting hash key.
pub async fn open_shards(c: &Client, stream: &str) -> Result<Vec<OpenShard>, BoxError> {
    let out = c.describe_stream().stream_name(stream).send().await?;
    let mut shards = Vec::new();
    for s in out.stream_description.map(|d| d.shards).unwrap_or_default() {
        let open =
            s.sequence_number_range.as_ref().is_none_or(|r| r.ending_sequence_number.is_none());
        let Some(range) = s.hash_key_range else { continue };
        if open {
            shards.push(OpenShard {
                id: s.shard_id,
                start: range.starting_hash_key.parse()?,
                end: range.ending_hash_key.parse()?,
            });
        }
    }
    shards.sort_by_key(|s| s.start);
    Ok(shards)
}

/// Splits the widest open shard in two; returns its id.
pub async fn split(c: &Client, stream: &str) -> Result<String, BoxError> {
    let shards = open_shards(c, stream).await?;
    let s = shards.iter().max_by_key(|s| s.end - s.start).ok_or("no open shard")?;
    let mid = s.start + (s.end - s.start) / 2 + 1;
    c.split_shard()
        .stream_name(stream)
        .shard_to_split(&s.id)
        .new_starting_hash_key(mid.to_string())
        .send()
        .await?;
    wait_active(c, stream).await?;
    Ok(s.id.clone())
}

/// Merges the two adjacent open shards with the narrowest union; returns their ids.
pub async fn merge(c: &Client, stream: &str) -> Result<(String, String), BoxError> {
    let shards = open_shards(c, stream).await?;
    let pair = shards
        .windows(2)
        .filter(|w| w[0].end.checked_add(1) == Some(w[1].start))
        .min_by_key(|w| w[1].end - w[0].start)
        .ok_or("no adjacent open shards")?;
    c.merge_shards()
        .stream_name(stream)
        .shard_to_merge(&pair[0].id)
        .adjacent_shard_to_merge(&pair[1].id)
        .send()
        .await?;
    wait_active(c, stream).await?;
    Ok((pair[0].id.clone(), pair[1].id.clone()))
}

/// Puts one record whose payload is `id`; returns its shard and sequence number.
pub async fn put(c: &Client, stream: &str, id: &str) -> Result<(String, String), BoxError> {
    let out = c
        .put_record()
        .stream_name(stream)
        .partition_key(id)
        .data(Blob::new(id.as_bytes().to_vec()))
        .send()
        .await?;
    Ok((out.shard_id, out.sequence_number))
}

/// Deletes `stream` (best effort, at the end of a run).
pub async fn delete_stream(c: &Client, stream: &str) {
    let _ = c.delete_stream().stream_name(stream).send().await;
}
