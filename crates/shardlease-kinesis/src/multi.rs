//! Several Kinesis streams consumed by one fleet (like the KCL's multi-stream tracker): a
//! [`MultiStreamSource`] is a core [`MultiSource`] of one [`KinesisSource`] per stream, all built
//! from one [`KinesisSourceBuilder`] (region, endpoint, credentials, read settings), with an
//! initial position per stream and streams added and removed at run time.
//!
//! Lease keys are `stream-name/shardId-…` (the stream's name also when it is given by ARN), so
//! two streams of the same name (in two accounts or regions) cannot share a fleet.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use shardlease_core::{
    Error, LeaseKey, MultiSource, Position, Result, ShardInfo, ShardReader, ShardSource, StreamSet,
};

use crate::api::StreamRef;
use crate::builder::KinesisSourceBuilder;

/// Several Kinesis streams as one [`ShardSource`]; see [`MultiStreamSource::builder`].
#[derive(Clone, Debug)]
pub struct MultiStreamSource {
    inner: MultiSource,
    template: KinesisSourceBuilder,
}

/// Builds a [`MultiStreamSource`].
#[derive(Debug)]
pub struct MultiStreamSourceBuilder {
    template: KinesisSourceBuilder,
    streams: Vec<(String, Option<Position>)>,
    grace: Option<Duration>,
}

/// The stream's name as lease keys carry it, checked against Kinesis's rules (1 to 128 of
/// `a-z A-Z 0-9 _ . -`); an ARN's last path segment.
fn stream_label(stream: &str) -> Result<String> {
    let label = StreamRef::parse(stream).label().to_owned();
    let ok = !label.is_empty()
        && label.len() <= 128
        && label.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !ok || (stream.starts_with("arn:") && !stream.contains(":stream/")) {
        return Err(Error::Config(format!(
            "{stream:?} is not a Kinesis stream name (1 to 128 of a-z A-Z 0-9 _ . -) or stream ARN"
        )));
    }
    Ok(label)
}

impl MultiStreamSource {
    /// A builder whose streams are all built from `template` (its own stream is ignored), e.g.
    /// `KinesisSource::builder("").region("us-east-1")`.
    pub fn builder(template: KinesisSourceBuilder) -> MultiStreamSourceBuilder {
        MultiStreamSourceBuilder { template, streams: Vec::new(), grace: None }
    }

    /// Starts reading `stream` (a name or an ARN) from the worker's initial position at the next
    /// shard sync. Errors as [`StreamSet::add`], and the stream's own listing or consumer errors.
    pub async fn add_stream(&self, stream: &str, initial: Option<Position>) -> Result<()> {
        let label = stream_label(stream)?;
        let source = self.template.clone().for_stream(stream.to_owned()).build().await?;
        let source: Arc<dyn ShardSource> = Arc::new(source);
        let set = self.inner.streams();
        match initial {
            Some(p) => set.add_at(label, source, p),
            None => set.add(label, source),
        }
    }

    /// Stops reading `stream` once the removal grace passes; the shard sync then finishes and
    /// deletes its leases. See [`StreamSet::remove`].
    pub fn remove_stream(&self, stream: &str) -> Result<()> {
        self.inner.streams().remove(&stream_label(stream)?)
    }

    /// The underlying set of streams (names as lease keys carry them).
    pub fn streams(&self) -> StreamSet {
        self.inner.streams()
    }
}

impl MultiStreamSourceBuilder {
    /// Adds a stream (name or ARN) read from the worker's configured initial position.
    pub fn stream(mut self, stream: impl Into<String>) -> Self {
        self.streams.push((stream.into(), None));
        self
    }

    /// Adds a stream (name or ARN) with its own initial position.
    pub fn stream_at(mut self, stream: impl Into<String>, initial: Position) -> Self {
        self.streams.push((stream.into(), Some(initial)));
        self
    }

    /// How long a removed stream is still read before its leases are finished and deleted
    /// (default [`shardlease_core::DEFAULT_REMOVAL_GRACE`]).
    pub fn removal_grace(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
        self
    }

    /// Builds one [`KinesisSource`](crate::KinesisSource) per stream. `Error::Config` for no
    /// stream, a bad name or ARN, or a stream given twice (also by name and ARN).
    pub async fn build(self) -> Result<MultiStreamSource> {
        if self.streams.is_empty() {
            return Err(Error::Config("a multi-stream source needs at least one stream".into()));
        }
        let mut seen = BTreeSet::new();
        for (s, _) in &self.streams {
            if !seen.insert(stream_label(s)?) {
                return Err(Error::Config(format!("stream {s:?} is listed twice")));
            }
        }
        let mut multi = MultiSource::builder();
        if let Some(g) = self.grace {
            multi = multi.removal_grace(g);
        }
        for (stream, initial) in self.streams {
            let label = stream_label(&stream)?;
            let source: Arc<dyn ShardSource> =
                Arc::new(self.template.clone().for_stream(stream).build().await?);
            multi = match initial {
                Some(p) => multi.stream_at(label, source, p),
                None => multi.stream(label, source),
            };
        }
        Ok(MultiStreamSource { inner: multi.build()?, template: self.template })
    }
}

#[async_trait]
impl ShardSource for MultiStreamSource {
    async fn list_shards(&self) -> Result<Vec<ShardInfo>> {
        self.inner.list_shards().await
    }

    async fn open(&self, shard: &LeaseKey, from: &Position) -> Result<Box<dyn ShardReader>> {
        self.inner.open(shard, from).await
    }

    fn initial_position(&self, shard: &LeaseKey) -> Option<Position> {
        self.inner.initial_position(shard)
    }

    fn retired(&self, key: &LeaseKey) -> bool {
        self.inner.retired(key)
    }

    fn keys_name_streams(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KinesisSource;

    fn err(b: MultiStreamSourceBuilder) -> String {
        let rt = tokio::runtime::Builder::new_current_thread().build();
        let rt = rt.unwrap_or_else(|e| panic!("{e}"));
        match rt.block_on(b.build()) {
            Err(Error::Config(m)) => m,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn configuration_errors_are_clear() {
        let b = || MultiStreamSource::builder(KinesisSource::builder("").region("us-east-1"));
        assert!(err(b()).contains("at least one stream"));
        assert!(err(b().stream("a").stream("a")).contains("twice"));
        let arn = "arn:aws:kinesis:us-east-1:123456789012:stream/a";
        assert!(err(b().stream("a").stream(arn)).contains("twice"));
        assert!(err(b().stream("")).contains("not a Kinesis stream"));
        assert!(err(b().stream("a/b")).contains("not a Kinesis stream"));
        assert!(err(b().stream("a b")).contains("not a Kinesis stream"));
        assert!(err(b().stream("arn:aws:kinesis:x")).contains("not a Kinesis stream"));
        assert_eq!(stream_label(arn).ok().as_deref(), Some("a"));
    }
}
