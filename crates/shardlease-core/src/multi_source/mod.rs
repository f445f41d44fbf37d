//! Several streams consumed by one fleet, as one [`ShardSource`]: one namespace, one balancer over
//! every stream's leases (so the fair share is across streams), lease keys that name their stream
//! (`stream/shard`, see [`qualify`]), an initial position per stream, and streams added and
//! removed while the fleet runs.
//!
//! A removed stream keeps being listed and read for a grace period (re-adding it within the
//! grace cancels the removal); after it, the stream is **retired**: no longer listed or opened,
//! and [`ShardSource::retired`] says so for its keys, so the runtime's shard sync finishes its
//! leases (fencing their owners) and deletes them at a later sync (docs/algorithm.md, "Streams
//! removed from a multi-stream source").

mod keys;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::lease::LeaseKey;
use crate::position::Position;
use crate::source::{Batch, ShardInfo, ShardReader, ShardSource};

pub use keys::{qualify, split_key, validate_stream_name, MAX_STREAM_NAME_BYTES, STREAM_SEPARATOR};

/// How long a removed stream is still read before its leases are retired, unless set.
pub const DEFAULT_REMOVAL_GRACE: Duration = Duration::from_secs(300);

/// One stream of the source.
struct Stream {
    source: Arc<dyn ShardSource>,
    initial: Option<Position>,
    /// When it was removed: still read until the grace passes.
    removed_at: Option<Instant>,
}

/// The streams, behind one mutex (held only to look up or change the map, never across I/O).
#[derive(Default)]
struct Streams {
    tracked: BTreeMap<String, Stream>,
    /// Streams removed whose grace passed (or removed without being tracked): their leases are
    /// retired.
    retired: BTreeMap<String, Instant>,
    /// Streams removed without being tracked (former streams), retired once the grace passes.
    former: BTreeMap<String, Instant>,
}

struct Inner {
    streams: Mutex<Streams>,
    grace: Duration,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Streams> {
        self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Moves the streams whose grace passed to `retired`.
    fn expire(&self, s: &mut Streams) {
        let now = Instant::now();
        let due = |at: &Instant| now.saturating_duration_since(*at) >= self.grace;
        let gone: Vec<String> = s
            .tracked
            .iter()
            .filter(|(_, st)| st.removed_at.as_ref().is_some_and(due))
            .map(|(n, _)| n.clone())
            .collect();
        for name in gone {
            if let Some(st) = s.tracked.remove(&name) {
                s.retired.insert(name, st.removed_at.unwrap_or(now));
            }
        }
        let former: Vec<String> =
            s.former.iter().filter(|(_, at)| due(at)).map(|(n, _)| n.clone()).collect();
        for name in former {
            if let Some(at) = s.former.remove(&name) {
                s.retired.insert(name, at);
            }
        }
    }

    /// The source of a tracked stream.
    fn source(&self, stream: &str) -> Option<Arc<dyn ShardSource>> {
        let mut s = self.lock();
        self.expire(&mut s);
        s.tracked.get(stream).map(|st| st.source.clone())
    }
}

/// Several streams as one [`ShardSource`]. Built with [`MultiSource::builder`]; streams are added
/// and removed at run time through [`MultiSource::streams`].
///
/// ```
/// use std::sync::Arc;
/// use shardlease_core::{MemorySource, MultiSource, Position};
/// let source = MultiSource::builder()
///     .stream("orders", Arc::new(MemorySource::new(2)))
///     .stream_at("clicks", Arc::new(MemorySource::new(1)), Position::Latest)
///     .build()?;
/// assert_eq!(source.streams().names(), ["clicks", "orders"]);
/// # Ok::<(), shardlease_core::Error>(())
/// ```
#[derive(Clone)]
pub struct MultiSource {
    inner: Arc<Inner>,
}

/// Adds and removes the streams of a [`MultiSource`] while the fleet runs (a clone of the
/// source's state: cheap to clone and to keep). Every worker of the fleet must be told the same
/// changes: a worker still reading a stream the others removed keeps creating its leases.
#[derive(Clone)]
pub struct StreamSet {
    inner: Arc<Inner>,
}

/// Builds a [`MultiSource`].
#[derive(Default)]
pub struct MultiSourceBuilder {
    streams: Vec<(String, Arc<dyn ShardSource>, Option<Position>)>,
    grace: Option<Duration>,
}

impl MultiSource {
    /// A builder with no stream and the [`DEFAULT_REMOVAL_GRACE`].
    pub fn builder() -> MultiSourceBuilder {
        MultiSourceBuilder::default()
    }

    /// The handle that adds and removes streams.
    pub fn streams(&self) -> StreamSet {
        StreamSet { inner: self.inner.clone() }
    }

    /// How long a removed stream is still read before its leases are retired.
    pub fn removal_grace(&self) -> Duration {
        self.inner.grace
    }
}

impl MultiSourceBuilder {
    /// Adds a stream read from the worker's configured initial position.
    pub fn stream(mut self, name: impl Into<String>, source: Arc<dyn ShardSource>) -> Self {
        self.streams.push((name.into(), source, None));
        self
    }

    /// Adds a stream with its own initial position (for shards no parent lease leads into).
    pub fn stream_at(
        mut self,
        name: impl Into<String>,
        source: Arc<dyn ShardSource>,
        initial: Position,
    ) -> Self {
        self.streams.push((name.into(), source, Some(initial)));
        self
    }

    /// How long a removed stream is still read before its leases are finished and deleted
    /// (default [`DEFAULT_REMOVAL_GRACE`]; zero retires it at once).
    pub fn removal_grace(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
        self
    }

    /// The source: `Error::Config` for no stream, a duplicate name, a bad name (see
    /// [`validate_stream_name`]) or an initial position that is not a starting point
    /// (`TrimHorizon`, `Latest`, `AtTimestamp`).
    pub fn build(self) -> Result<MultiSource> {
        if self.streams.is_empty() {
            return Err(Error::Config("a multi-stream source needs at least one stream".into()));
        }
        let grace = self.grace.unwrap_or(DEFAULT_REMOVAL_GRACE);
        if grace > crate::config::MAX_DURATION {
            return Err(Error::Config("the removal grace is longer than 30 days".into()));
        }
        let inner = Arc::new(Inner { streams: Mutex::new(Streams::default()), grace });
        let set = StreamSet { inner: inner.clone() };
        for (name, source, initial) in self.streams {
            if set.names().contains(&name) {
                return Err(Error::Config(format!("stream {name:?} is listed twice")));
            }
            set.add_inner(name, source, initial)?;
        }
        Ok(MultiSource { inner })
    }
}

/// Checks that `p` is a starting point.
fn check_initial(stream: &str, p: &Position) -> Result<()> {
    match p {
        Position::TrimHorizon | Position::Latest | Position::AtTimestamp { .. } => Ok(()),
        other => Err(Error::Config(format!(
            "the initial position of stream {stream:?} must be TRIM_HORIZON, LATEST or \
             AT_TIMESTAMP, not {other}"
        ))),
    }
}

impl StreamSet {
    /// The names of the streams read now (removed ones still in their grace included), sorted.
    pub fn names(&self) -> Vec<String> {
        let mut s = self.inner.lock();
        self.inner.expire(&mut s);
        s.tracked.keys().cloned().collect()
    }

    /// The names of the streams removed and not yet retired (in their grace), sorted.
    pub fn removing(&self) -> Vec<String> {
        let mut s = self.inner.lock();
        self.inner.expire(&mut s);
        let tracked = s.tracked.iter().filter(|(_, st)| st.removed_at.is_some());
        tracked.map(|(n, _)| n.clone()).chain(s.former.keys().cloned()).collect()
    }

    /// The names of the retired streams (removed, grace passed), sorted.
    pub fn retired(&self) -> Vec<String> {
        let mut s = self.inner.lock();
        self.inner.expire(&mut s);
        s.retired.keys().cloned().collect()
    }

    /// Starts reading `name` (from the worker's initial position) at the next shard sync.
    /// Re-adding a stream in its removal grace cancels the removal (keeping its first source).
    /// `Error::Config` for a bad name, a stream already read, or a retired one (its leases are
    /// being finished and deleted; use another name).
    pub fn add(&self, name: impl Into<String>, source: Arc<dyn ShardSource>) -> Result<()> {
        self.add_inner(name.into(), source, None)
    }

    /// Like [`StreamSet::add`], with the stream's own initial position.
    pub fn add_at(
        &self,
        name: impl Into<String>,
        source: Arc<dyn ShardSource>,
        initial: Position,
    ) -> Result<()> {
        self.add_inner(name.into(), source, Some(initial))
    }

    fn add_inner(
        &self,
        name: String,
        source: Arc<dyn ShardSource>,
        initial: Option<Position>,
    ) -> Result<()> {
        validate_stream_name(&name)?;
        if let Some(p) = &initial {
            check_initial(&name, p)?;
        }
        let mut s = self.inner.lock();
        self.inner.expire(&mut s);
        if s.retired.contains_key(&name) {
            return Err(Error::Config(format!(
                "stream {name:?} was removed and its leases retired; it cannot be added again \
                 under the same name by this process"
            )));
        }
        s.former.remove(&name);
        match s.tracked.get_mut(&name) {
            Some(st) if st.removed_at.is_some() => {
                st.removed_at = None;
                tracing::info!(stream = %name, "stream added again within its removal grace");
                Ok(())
            }
            Some(_) => Err(Error::Config(format!("stream {name:?} is already read"))),
            None => {
                s.tracked.insert(name.clone(), Stream { source, initial, removed_at: None });
                tracing::info!(stream = %name, "stream added");
                Ok(())
            }
        }
    }

    /// Stops reading `name` once the removal grace passes; its leases are then finished and
    /// deleted by the shard sync. A stream this process does not read (one removed before a
    /// restart, say) is retired the same way once the grace passes. `Error::Config` for a bad
    /// name. Removing a stream already removed changes nothing.
    pub fn remove(&self, name: &str) -> Result<()> {
        validate_stream_name(name)?;
        let mut s = self.inner.lock();
        self.inner.expire(&mut s);
        let now = Instant::now();
        match s.tracked.get_mut(name) {
            Some(st) => {
                if st.removed_at.is_none() {
                    st.removed_at = Some(now);
                    tracing::info!(stream = %name, grace = ?self.inner.grace, "stream removed; its leases are retired after the grace");
                }
            }
            None => {
                if !s.retired.contains_key(name) {
                    s.former.entry(name.to_owned()).or_insert(now);
                }
            }
        }
        self.inner.expire(&mut s);
        Ok(())
    }
}

impl fmt::Debug for MultiSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = self.streams();
        f.debug_struct("MultiSource")
            .field("streams", &set.names())
            .field("removing", &set.removing())
            .field("retired", &set.retired())
            .field("removal_grace", &self.inner.grace)
            .finish()
    }
}

impl fmt::Debug for StreamSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamSet").field("streams", &self.names()).finish()
    }
}

#[async_trait]
impl ShardSource for MultiSource {
    /// Every tracked stream's shards, qualified. A stream whose listing fails fails the whole
    /// listing: a partial one would look like shards that vanished.
    async fn list_shards(&self) -> Result<Vec<ShardInfo>> {
        let sources: Vec<(String, Arc<dyn ShardSource>)> = {
            let mut s = self.inner.lock();
            self.inner.expire(&mut s);
            s.tracked.iter().map(|(n, st)| (n.clone(), st.source.clone())).collect()
        };
        let listed = futures::future::join_all(sources.iter().map(|(_, src)| src.list_shards()));
        let mut out = Vec::new();
        for ((name, _), shards) in sources.iter().zip(listed.await) {
            let shards = shards.map_err(|e| {
                Error::retryable(format!(
                    "listing the shards of stream {name:?}: {}",
                    crate::error::ErrorChain(&e)
                ))
            })?;
            out.extend(shards.into_iter().map(|sh| keys::qualify_info(name, sh)));
        }
        Ok(out)
    }

    async fn open(&self, shard: &LeaseKey, from: &Position) -> Result<Box<dyn ShardReader>> {
        let Some((stream, id)) = split_key(shard) else {
            return Err(Error::InvalidInput(format!(
                "lease key {shard} does not name a stream (expected stream/shard)"
            )));
        };
        let Some(source) = self.inner.source(stream) else {
            return Err(Error::InvalidInput(format!("stream {stream:?} is not read (any more)")));
        };
        let reader = source.open(&id, from).await?;
        Ok(Box::new(QualifiedReader { stream: stream.to_owned(), inner: reader }))
    }

    fn initial_position(&self, shard: &LeaseKey) -> Option<Position> {
        let (stream, _) = split_key(shard)?;
        self.inner.lock().tracked.get(stream).and_then(|st| st.initial.clone())
    }

    fn retired(&self, key: &LeaseKey) -> bool {
        let Some((stream, _)) = split_key(key) else { return false };
        let mut s = self.inner.lock();
        self.inner.expire(&mut s);
        s.retired.contains_key(stream)
    }

    fn keys_name_streams(&self) -> bool {
        true
    }
}

/// A reader of one stream's shard whose shard-end children are qualified like the listing.
struct QualifiedReader {
    stream: String,
    inner: Box<dyn ShardReader>,
}

#[async_trait]
impl ShardReader for QualifiedReader {
    async fn next_batch(&mut self) -> Result<Batch> {
        let mut batch = self.inner.next_batch().await?;
        if let Some(children) = batch.end.take() {
            let stream = &self.stream;
            batch.end = Some(children.into_iter().map(|c| keys::qualify_info(stream, c)).collect());
        }
        Ok(batch)
    }

    fn resolved_start(&self) -> Option<Position> {
        self.inner.resolved_start()
    }
}
