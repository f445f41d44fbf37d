//! [`Lister`]: every `DescribeStream` call of one source, paced and shared.
//!
//! DynamoDB Streams allows about 10 `DescribeStream` calls per second per account and region,
//! returns at most 100 shards a page, and a big table has thousands of shards. So one source (one
//! worker, however many leases it holds) makes its calls through one `Lister`:
//!
//! - **Paced**: at most `describe_calls_per_second`, one call at a time; a throttled call backs
//!   off with jitter and is tried again.
//! - **Shared**: a full listing younger than `listing_max_age` is reused, and callers that arrive
//!   while one is under way wait for it instead of starting their own.
//! - **Lineage rules** ([`shard_infos`]): a shard is closed when it has an ending sequence number
//!   *or* a listed child (DynamoDB keeps reporting a parent open for a while after its child
//!   appears); parents are reported as listed (a parent past retention is simply not listed, and
//!   the core treats a missing parent as finished).
//! - **Children of a finished shard** ([`Lister::children_of`]): one `CHILD_SHARDS` call, then
//!   the shared full listing as the fallback. None listed while the stream is enabled means "not
//!   yet" (DynamoDB closes a shard before it lists the child), never "finished without children";
//!   only a disabled stream finishes a shard without children.

use std::collections::HashSet;
use std::sync::Arc;

use shardlease_core::{Error, LeaseKey, Result, ShardInfo};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::debug;

use crate::api::{Api, ApiError, DescribeRequest, StreamPage, StreamShard, StreamStatus};
use crate::config::ReadConfig;
use crate::telemetry;

/// Pages a listing may take before the service's page ids are called a loop.
const MAX_PAGES: usize = 10_000;

/// A full listing of the stream.
#[derive(Clone, Debug)]
pub(crate) struct Listing {
    pub status: StreamStatus,
    pub shards: Vec<StreamShard>,
}

/// What a finished shard learns about its children.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Children {
    /// The children, as shards of the source.
    Found(Vec<ShardInfo>),
    /// None listed yet, and the stream is enabled: ask again later.
    NotYet,
    /// None, and none will come: the stream is disabled.
    Never,
}

/// The paced, shared `DescribeStream` caller of one source.
#[derive(Debug)]
pub(crate) struct Lister {
    api: Arc<dyn Api>,
    config: Arc<ReadConfig>,
    /// When the next call may be sent; held across the wait, so calls go one at a time.
    next_call: Mutex<Instant>,
    /// The last full listing and when it was started; held while a listing is under way.
    cache: Mutex<Option<(Instant, Arc<Listing>)>>,
}

impl Lister {
    pub(crate) fn new(api: Arc<dyn Api>, config: Arc<ReadConfig>) -> Self {
        Lister { api, config, next_call: Mutex::new(Instant::now()), cache: Mutex::new(None) }
    }

    /// One `DescribeStream` call, paced, with throttled and retryable failures tried again.
    async fn call(&self, request: DescribeRequest) -> Result<StreamPage> {
        let kind = match request {
            DescribeRequest::Page { .. } => "page",
            DescribeRequest::ChildrenOf { .. } => "children",
        };
        let mut attempt = 0u32;
        loop {
            {
                let mut next = self.next_call.lock().await;
                tokio::time::sleep_until(*next).await;
                *next = Instant::now() + self.config.describe_gap();
            }
            metrics::counter!(telemetry::DESCRIBE_STREAM, telemetry::KIND => kind).increment(1);
            let failure = match self.api.describe_stream(request.clone()).await {
                Ok(page) => return Ok(page),
                Err(ApiError::Throttled(e)) => {
                    metrics::counter!(telemetry::THROTTLED).increment(1);
                    e
                }
                Err(ApiError::Other(e)) if e.is_retryable() => e,
                Err(e) => return Err(e.into_error()),
            };
            attempt += 1;
            if attempt > self.config.max_retries {
                return Err(failure);
            }
            let wait = self.config.backoff(attempt);
            debug!(error = %failure, ?wait, "DescribeStream failed; retrying");
            tokio::time::sleep(wait).await;
        }
    }

    /// Every shard the stream lists, from a listing younger than `listing_max_age` if there is
    /// one (`fresh_after`: and started no earlier than that).
    pub(crate) async fn full(&self, fresh_after: Option<Instant>) -> Result<Arc<Listing>> {
        let mut cache = self.cache.lock().await;
        if let Some((at, listing)) = cache.as_ref() {
            let young = at.elapsed() <= self.config.listing_max_age;
            if young && fresh_after.is_none_or(|t| *at >= t) {
                return Ok(listing.clone());
            }
        }
        let started = Instant::now();
        let mut shards = Vec::new();
        let mut exclusive_start = None;
        for _ in 0..MAX_PAGES {
            let page = self.call(DescribeRequest::Page { exclusive_start }).await?;
            shards.extend(page.shards);
            match page.last_evaluated {
                Some(last) if !last.is_empty() => exclusive_start = Some(last),
                _ => {
                    let listing = Arc::new(Listing { status: page.status, shards });
                    *cache = Some((started, listing.clone()));
                    return Ok(listing);
                }
            }
        }
        Err(Error::retryable(format!(
            "DynamoDB Streams DescribeStream of {} did not finish within {MAX_PAGES} pages",
            self.api.stream_arn()
        )))
    }

    /// Every shard, as the source reports it (see [`shard_infos`]).
    pub(crate) async fn shards(&self) -> Result<Vec<ShardInfo>> {
        Ok(shard_infos(&self.full(None).await?.shards))
    }

    /// The children of `shard`, which was read to its end at `ended_at`.
    pub(crate) async fn children_of(
        &self,
        shard: &LeaseKey,
        ended_at: Instant,
    ) -> Result<Children> {
        let parent = shard.as_str();
        // A listing made since the end may already name them (shards of a table end together).
        if let Some(found) = self.cached_children(parent, ended_at).await {
            return Ok(Children::Found(found));
        }
        match self.call(DescribeRequest::ChildrenOf { parent: parent.to_owned() }).await {
            Ok(page) => {
                let found = children_in(&page.shards, parent);
                if !found.is_empty() {
                    return Ok(Children::Found(found));
                }
            }
            // A service that refuses the filter: the full listing answers instead.
            Err(e) => {
                debug!(shard = %shard, error = %e, "CHILD_SHARDS listing failed; listing all")
            }
        }
        let listing = self.full(Some(ended_at)).await?;
        let found = children_in(&listing.shards, parent);
        if !found.is_empty() {
            return Ok(Children::Found(found));
        }
        match listing.status {
            StreamStatus::Disabled | StreamStatus::Disabling => Ok(Children::Never),
            StreamStatus::Enabled | StreamStatus::Enabling => Ok(Children::NotYet),
        }
    }

    async fn cached_children(&self, parent: &str, ended_at: Instant) -> Option<Vec<ShardInfo>> {
        let cache = self.cache.lock().await;
        let (at, listing) = cache.as_ref()?;
        let found = children_in(&listing.shards, parent);
        (*at >= ended_at && !found.is_empty()).then_some(found)
    }
}

/// The children of `parent` among `shards`, as shards of the source. Closed by their own
/// ending sequence number only: a page of children does not show grandchildren.
fn children_in(shards: &[StreamShard], parent: &str) -> Vec<ShardInfo> {
    let infos = shard_infos(shards);
    infos.into_iter().filter(|s| s.parents.iter().any(|p| p.as_str() == parent)).collect()
}

/// Shards as the source reports them: closed when the service says so (an ending sequence
/// number) or when a listed shard names them as its parent.
pub(crate) fn shard_infos(shards: &[StreamShard]) -> Vec<ShardInfo> {
    let parents: HashSet<&str> = shards.iter().filter_map(|s| s.parent.as_deref()).collect();
    shards
        .iter()
        .map(|s| {
            let closed = s.ending_seq.is_some() || parents.contains(s.id.as_str());
            let parents =
                s.parent.iter().filter(|p| !p.is_empty()).map(|p| LeaseKey::from(p.as_str()));
            ShardInfo::new(s.id.as_str()).with_parents(parents).with_closed(closed)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(id: &str, parent: Option<&str>, ended: bool) -> StreamShard {
        StreamShard {
            id: id.into(),
            parent: parent.map(Into::into),
            ending_seq: ended.then(|| "200000000000000000000".into()),
        }
    }

    #[test]
    fn a_parent_listed_open_with_a_child_is_closed() {
        let infos = shard_infos(&[shard("a", None, false), shard("b", Some("a"), false)]);
        assert!(infos[0].closed, "{infos:?}");
        assert!(!infos[1].closed);
        assert_eq!(infos[1].parents, vec![LeaseKey::from("a")]);
        let infos = shard_infos(&[shard("c", Some("gone"), true)]);
        assert!(infos[0].closed);
        assert_eq!(
            infos[0].parents,
            vec![LeaseKey::from("gone")],
            "a parent past retention stays named"
        );
    }
}
